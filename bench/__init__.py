"""Benchmarks of django-durable against raw PostgreSQL and peer libraries (``python bench/run.py``)."""
