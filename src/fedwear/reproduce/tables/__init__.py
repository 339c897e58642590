"""One module per paper: its experiments (tables) and the findings they print."""
