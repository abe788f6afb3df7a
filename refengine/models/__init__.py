"""Plain model code with no TP inside: the Llama target and the EAGLE-3 head."""
