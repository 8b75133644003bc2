"""Incidents: SLA breaches, incident timelines, chaos drills, root-cause hints, postmortems."""
