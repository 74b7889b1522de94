"""Tests of mighty.trace."""
