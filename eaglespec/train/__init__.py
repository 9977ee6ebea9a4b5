"""Training draft heads: data preparation, regeneration, feature capture, training."""
