"""The `tokenshop` command, assembled from the commands each package contributes."""
