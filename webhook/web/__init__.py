"""HTTP: the Flask app serving AdmissionReviews, health and metrics."""
