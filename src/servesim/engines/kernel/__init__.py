"""Shared virtual-time machinery for engines: tokens, requests, records."""
