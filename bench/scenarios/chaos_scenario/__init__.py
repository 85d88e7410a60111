"""The chaos scenario (bench/scenarios/chaos): see main.py."""
