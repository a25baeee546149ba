"""Tools the agentic workflows call: the remote BM25 search service."""
