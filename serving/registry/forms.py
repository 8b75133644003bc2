"""Page forms of the model registry and of deployments; they check shape only, services own
the rules."""

from __future__ import annotations

from django import forms

from serving.registry.models import ModelTask


class ModelCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Letters, digits, '.', '_' and '-'.")
    task = forms.ChoiceField(choices=ModelTask.choices, initial=ModelTask.TEXT_GENERATION)
    description = forms.CharField(
        max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2})
    )


class DescriptionForm(forms.Form):
    description = forms.CharField(
        max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2})
    )


def engines_field() -> forms.MultipleChoiceField:
    return forms.MultipleChoiceField(
        choices=[
            ("builtin", "Built-in engine (Llama)"),
            ("vllm", "vLLM (any architecture it runs)"),
        ],
        initial=["builtin"],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Validate for",
        help_text="A deployment can run the version only on the engines it was validated for.",
    )


class RegisterPathForm(forms.Form):
    label = forms.CharField(max_length=64)
    path = forms.CharField(
        max_length=900,
        help_text="Absolute path of a directory with config.json, "
        "*.safetensors and tokenizer.json, under the portal's allowed roots.",
    )
    sha256 = forms.CharField(max_length=64, required=False, label="Expected SHA-256 (optional)")
    engines = engines_field()


class UploadForm(forms.Form):
    label = forms.CharField(max_length=64)
    archive = forms.FileField(help_text="A .tar or .tar.gz of the checkpoint directory.")
    sha256 = forms.CharField(max_length=64, required=False, label="Expected SHA-256 (optional)")
    engines = engines_field()
