"""Pipeline definition, configuration and runners."""
