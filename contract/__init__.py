"""The Beam-free data contract: manifest schema, feature specs, dataset discovery; and in `bert_datagen.contract.cli`
the CLI plumbing and the output lock both command lines share."""
