"""MARLaaS as a service: OpenAI-compatible files / fine-tuning jobs / models API
over a SQL job store (see docs/design.md §6).

Modules: ``config`` (ServiceConfig), ``tables`` + ``db`` + ``migrations`` (schema),
``store`` (JobStore: every read and write, API side and scheduler side), ``auth``,
``api`` (create_app) + ``routes_*``, ``router`` (ModelRouter, VLLMModelRouter),
``metrics`` (ServiceMetrics), ``server`` (run_api), ``cli`` (operator commands),
``status``. Import from the modules; this package imports nothing heavy.
"""
