"""EAGLE-3 drafter training whose drafters match the server that runs them."""
