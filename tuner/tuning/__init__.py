"""The tuner: cost model fitted from phase measurements and acceptance, and live tuning over a backend."""
