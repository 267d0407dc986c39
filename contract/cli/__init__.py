"""What both command lines share besides the data contract: the click group plumbing and the output lock."""
