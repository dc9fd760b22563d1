"""The averaging theory: closed forms of the adjacency pattern at initialisation and along training."""
