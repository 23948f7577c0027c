"""The admin API and what operators watch: pipes, stats, clients, bridges, the mirror,
analytics, metrics and the live page.
"""
