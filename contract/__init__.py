"""The Beam-free data contract: manifest schema, feature specs, dataset discovery, a filesystem seam."""
