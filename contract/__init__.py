"""The Beam-free data contract: manifest schema, feature specs, dataset discovery; and in `contract.cli`
the CLI plumbing and the output lock both command lines share."""
