"""Loaders, samplers and sharding, batch moves."""
