"""The service's foundations below the engine: settings, metrics, the loop."""
