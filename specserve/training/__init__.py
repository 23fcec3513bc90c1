"""Training of speculation artifacts: Medusa heads by self-distillation (`train-medusa`)."""
