"""Discrete-event (simpy) network simulator of data-parallel gradient communication."""
