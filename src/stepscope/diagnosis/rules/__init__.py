"""Diagnosis rules, one module per bottleneck family; :data:`RULES` is the explicit ordered list."""

from __future__ import annotations

RULES: tuple = ()
