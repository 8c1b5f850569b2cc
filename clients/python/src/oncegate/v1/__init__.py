"""Stubs generated from ``proto/oncegate/v1/oncegate.proto`` by ``clients/python/generate.py``."""
