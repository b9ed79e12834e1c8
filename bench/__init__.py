"""Benchmarks of django-durable against raw PostgreSQL and peer libraries.

Run ``python bench/run.py`` (or ``make bench``); see docs/benchmarks.md.
"""
