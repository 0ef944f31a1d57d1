"""The names transformers finds BrainAI by: config.json's model_type and auto_map, and the files they point into."""

MODEL_TYPE = "brain_ai"
CONFIGURATION = "configuration_brain_ai"
MODELING = "modeling_brain_ai"
CONFIG_CLASS = "BrainAIHFConfig"
MODEL_CLASS = "BrainAIForCausalLM"
