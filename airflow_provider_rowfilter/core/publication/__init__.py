"""The publication model: publications as PostgreSQL stores and defines them, the tables they publish, the catalog."""
