"""What every page shares: the store, the signed-in person (password or single sign-on), the navigation by role,
and the look."""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import streamlit as st
from sqlalchemy import Engine

from tracemill.settings import Settings, get_settings
from tracemill.store import traces
from tracemill.store.engine import make_engine
from tracemill.store.migrate import is_current
from tracemill.ui import users
from tracemill.ui.access import Identity
from tracemill.ui.queue import QueueRules
from tracemill.ui.style import CSS

PAGES = Path(__file__).resolve().parent / "pages"
IDENTITY = "tracemill.identity"
ANY = "any"  # a filter's choice of no value (`choice`)


@dataclass(frozen=True, slots=True)
class Context:
    engine: Engine
    who: Identity
    settings: Settings
    rules: QueueRules

    @property
    def store_key(self) -> str:
        """What cached reads are keyed on: the store."""
        return self.engine.url.render_as_string(hide_password=False)


@dataclass
class Kept:
    """A value a UI process keeps per store and brings up to date on each visit (counts that read only new calls),
    one session at a time."""

    value: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)


@st.cache_resource(show_spinner=False)
def kept(store_key: str, name: str) -> Kept:
    return Kept()


def choice(label: str, values: list[str], key: str) -> str | None:
    """A filter's select box: one of `values`, or None where it is left at `any`."""
    picked = st.selectbox(label, [ANY, *values], key=key)
    return None if picked == ANY else picked


def facets(ctx: Context) -> traces.Facets:
    """The values the pages' filters offer (models, tools, services, ...), brought up to date with the new calls."""
    held = kept(ctx.store_key, "facets")
    with held.lock, ctx.engine.connect() as conn:
        held.value = traces.facets(conn, known=held.value)
        return held.value


@st.cache_resource(show_spinner=False)
def _engine(url: str) -> Engine:
    return make_engine(url)


def context() -> Context:
    """The store, settings and signed-in person of this session; pages call this first."""
    settings = get_settings()
    who = st.session_state.get(IDENTITY)
    if who is None:
        st.stop()
    return Context(_engine(settings.database_url), who, settings, QueueRules.from_settings(settings))


def _sso_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # no secrets file: no single sign-on
        return False


def _sign_in(engine: Engine, settings: Settings) -> Identity | None:
    if _sso_configured() and st.user.is_logged_in:
        who = users.sso_identity(engine, st.user.get("email"))
        if who is None:
            st.error(f"{st.user.get('email') or 'This account'} may not use Tracemill here: an admin adds you with "
                     "`tracemill users add NAME --email EMAIL --role viewer`.")
            st.button("Sign out", on_click=st.logout)
            return None
        return who
    _, middle, _ = st.columns([1, 1.2, 1])
    with middle:
        st.markdown('<div class="tm-brand">◆ Tracemill</div>', unsafe_allow_html=True)
        st.caption("Traces, failure modes and human review of your agents' tool calls.")
        with st.form("sign-in"):
            name = st.text_input("Name", key="sign_in_name")
            password = st.text_input("Password", type="password", key="sign_in_password")
            submitted = st.form_submit_button("Sign in", type="primary", width="stretch")
        if submitted:
            limit = users.SignInLimit(settings.sign_in_attempts, timedelta(seconds=settings.sign_in_window_seconds))
            try:
                return users.sign_in(engine, name, password, limit)
            except users.SignInRefused as refused:
                st.error(f"Sign-in refused: {refused}")
        if _sso_configured():
            st.button("Sign in with single sign-on", on_click=st.login, width="stretch")
    return None


def _sign_out() -> None:
    who = st.session_state.pop(IDENTITY, None)
    st.session_state.clear()
    if who is not None and who.via == "sso":
        st.logout()


def main() -> None:
    st.set_page_config(page_title="Tracemill", page_icon="◆", layout="wide", initial_sidebar_state="expanded")
    st.html(f"<style>{CSS}</style>")
    settings = get_settings()
    engine = _engine(settings.database_url)
    if not is_current(engine):
        st.error(f"The store at {engine.url.render_as_string(hide_password=True)} is not at the newest schema: run "
                 "`tracemill db upgrade --db URL`.")
        st.stop()
    if st.session_state.get(IDENTITY) is None:
        who = _sign_in(engine, settings)
        if who is None:
            st.stop()
        st.session_state[IDENTITY] = who
        st.rerun()
    who = st.session_state[IDENTITY]
    pages = {
        "Explore": [st.Page(PAGES / "traces.py", title="Traces", icon=":material/account_tree:", default=True),
                    st.Page(PAGES / "failures.py", title="Failure modes", icon=":material/insights:"),
                    st.Page(PAGES / "findings.py", title="Findings", icon=":material/lightbulb:")],
        "Review": [st.Page(PAGES / "review.py", title="Review queue", icon=":material/fact_check:")],
        "Learn": [st.Page(PAGES / "datasets.py", title="Datasets", icon=":material/dataset:"),
                  st.Page(PAGES / "models.py", title="Models and deployments", icon=":material/rocket_launch:")],
    }
    page = st.navigation(pages)
    with st.sidebar:
        st.markdown(f'<div class="tm-who"><b>{html.escape(who.name)}</b> · {who.role.value}</div>',
                    unsafe_allow_html=True)
        st.button("Sign out", on_click=_sign_out, key="sign_out")
    page.run()

