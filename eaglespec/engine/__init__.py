"""The one generation loop (vanilla = no proposer) and stop conditions."""
