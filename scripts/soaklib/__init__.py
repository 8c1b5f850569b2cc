"""The soak (scripts/soak.py): deployments, clients, provider, nemesis, operator, history, checker."""
