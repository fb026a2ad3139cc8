"""Admin for retry policy overrides."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ..models import RetryPolicy
from ..registry import default_registry

# --------------------------------------------------------------------------------------------
# Retry policies


def _describe_policy(policy: Any) -> str:
    if policy is None:
        return "—"
    delays = ", ".join(f"{d:g}s" for d in policy.schedule()[:6])
    if policy.max_attempts - 1 > 6:
        delays += ", …"
    return f"{policy.max_attempts} attempts; delays {delays or 'none'}; {policy.jitter} jitter"


class RetryPolicyForm(forms.ModelForm):
    """The receiver field lists the receivers registered in this process."""

    class Meta:
        model = RetryPolicy
        fields = (
            "receiver",
            "enabled",
            "max_attempts",
            "initial_delay",
            "multiplier",
            "max_delay",
            "jitter",
            "dont_retry",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        known = default_registry.all()
        if not known:
            return
        choices: list[tuple[str, str]] = [("", "---------")]
        for rec in known:
            code = _describe_policy(rec.policy) if rec.policy else _("settings default")
            choices.append(
                (rec.name, f"{rec.name} — topics {', '.join(rec.routing_keys)}; code: {code}")
            )
        current = self.instance.receiver if self.instance and self.instance.pk else ""
        if current and current not in {r.name for r in known}:
            choices.append((current, f"{current} (not registered in this process)"))
        self.fields["receiver"] = forms.ChoiceField(
            label=_("receiver"),
            choices=choices,
            help_text=_(
                "The receivers registered in this project (rmq_consume --list shows the same). "
                "This row overrides the policy declared in code; consumers pick it up within "
                "POLICY_CACHE_SECONDS."
            ),
        )


@admin.register(RetryPolicy)
class RetryPolicyAdmin(admin.ModelAdmin):
    form = RetryPolicyForm
    list_display = (
        "receiver",
        "enabled",
        "max_attempts",
        "delays",
        "jitter",
        "registered",
        "updated_at",
    )
    list_filter = ("enabled", "jitter")
    search_fields = ("receiver",)
    readonly_fields = ("updated_at",)
    fields = (
        "receiver",
        "enabled",
        "max_attempts",
        ("initial_delay", "multiplier", "max_delay"),
        "jitter",
        "dont_retry",
        "updated_at",
    )

    @admin.display(description=_("delays"))
    def delays(self, obj: RetryPolicy) -> str:
        try:
            schedule = obj.to_policy().schedule()
        except ValueError as exc:
            return f"invalid: {exc}"
        text = ", ".join(f"{d:g}s" for d in schedule[:6])
        return text + (", …" if len(schedule) > 6 else "") if text else "—"

    @admin.display(description=_("registered"), boolean=True)
    def registered(self, obj: RetryPolicy) -> bool:
        return default_registry.get(obj.receiver) is not None
