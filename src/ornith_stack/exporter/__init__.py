"""The ornith-stack exporter: engine /metrics in, unified `ornith_*` metrics out (see catalogue.py)."""
