"""tls layer."""
