"""WordPiece vocabularies and a tokenizer identical to the original BERT tokenizer."""
