"""Support code imported by generated packages: plan types, varlen indexing, input validation."""
