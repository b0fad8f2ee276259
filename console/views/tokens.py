"""Personal API tokens: create one (shown once, only its digest is kept) and revoke it."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console.forms import TokenForm
from console.models import ApiToken
from console.views.common import AuthenticatedHtmxRequest, render_page


def _page(
    request: AuthenticatedHtmxRequest, form: TokenForm, new_token: str | None, status: int = 200
):
    tokens = ApiToken.objects.filter(user=request.user).order_by("revoked_at", "-created_at")
    context = {"form": form, "tokens": tokens, "new_token": new_token}
    return render_page(request, "console/tokens.html", context, status=status)


@login_required
def tokens(request: AuthenticatedHtmxRequest) -> HttpResponse:
    """List the signed-in user's tokens; POST creates one and shows it once."""
    if request.method == "POST":
        form = TokenForm(request.POST)
        if not form.is_valid():
            return _page(request, form, None, status=400)
        _, plain = ApiToken.issue(request.user, name=form.cleaned_data["name"])
        # Rendered in this response only: it is never stored and never shown again.
        response = _page(request, TokenForm(), plain, status=201)
        response["Cache-Control"] = "no-store"
        return response
    return _page(request, TokenForm(), None)


@require_POST
@login_required
def revoke_token(request: AuthenticatedHtmxRequest, token_id: int) -> HttpResponse:
    """Revoke one of the signed-in user's own tokens."""
    token = ApiToken.objects.filter(id=token_id, user=request.user).first()
    if token is None:
        raise Http404("no such token of yours")
    if token.revoked_at is None:
        token.revoke()
        messages.success(request, f"Token {token.prefix}… revoked.")
    return redirect("console:tokens")
