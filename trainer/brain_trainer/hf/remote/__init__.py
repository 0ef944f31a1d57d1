"""BrainAI for Hugging Face `transformers`: the configuration and the model its remote-code loader imports.

These modules are the sources `hf/inline.py` turns into the export's `configuration_brain_ai.py` and
`modeling_brain_ai.py` (their brain_trainer imports copied in); they import `transformers`, which brain-train
itself does not need.
"""
