"""Real backends of the unified KVStore API, one module each (see ``ddpbench.api``)."""
