"""What a run reports: metrics records, summary tables and plots, provenance (run.json)."""
