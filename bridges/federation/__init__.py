"""Federation links between RestMS gateways (issue 25): bridges of kind ``federation``."""
