"""What the book shows: figures and the scorecard."""
