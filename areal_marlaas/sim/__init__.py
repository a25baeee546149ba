"""Discrete-event simulation of the scheduling core at cluster scale."""
