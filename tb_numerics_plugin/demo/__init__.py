"""Demo programs that produce tfdbg2 dumps with NaNs in them."""
