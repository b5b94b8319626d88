"""Seed 001's Schema-Guided Reasoning pricing agent, against ``formline serve``.

Three phases, each one chat completion whose output is constrained by a Pydantic schema,
sent exactly as to vLLM (``extra_body={"guided_json": ..., "guided_decoding_backend": ...}``
through the official ``openai`` client):

1. route   (Routing: ``RouterSchema``, a union of a feature lookup and a direct answer);
2. fetch   the user's features from a small SQLite feature store, then assess the risk
           (Cycle: ``RiskAssessment``, 2 to 4 factors);
3. decide  (Cascade: ``PricingLogic``, the analysis fields before the decision).

Every phase is written to an audit log (printed, and kept in the SQLite file), including a
check the schema cannot make: the discount must not exceed the cart's margin.

    formline serve &                       # the embedded SmolLM2-135M on 127.0.0.1:8000
    python examples/sgr_pricing/agent.py "I want a discount or I'm leaving!" --user user_102
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from typing import Annotated, Any, Literal, TypeVar

from openai import OpenAI
from pydantic import BaseModel, Field

# Strings are bounded so a small model cannot run on until max_tokens; formline enforces
# maxLength up to 64 while decoding (a longer one is only checked after).
Text = Annotated[str, Field(max_length=64)]


class FeatureLookup(BaseModel):
    """Route to the feature store when pricing context is needed."""

    rationale: Text
    tool_name: Literal["fetch_user_features"] = "fetch_user_features"
    user_id: Annotated[str, Field(max_length=20)]


class GeneralResponse(BaseModel):
    """Answer directly: the query is not about pricing."""

    tool_name: Literal["respond"] = "respond"
    content: Text


class RouterSchema(BaseModel):
    action: FeatureLookup | GeneralResponse


class RiskFactor(BaseModel):
    explanation: Text
    severity: Literal["low", "medium", "high"]


class RiskAssessment(BaseModel):
    """Two to four risk factors of offering this customer a discount."""

    factors: Annotated[list[RiskFactor], Field(min_length=2, max_length=4)]


class PricingLogic(BaseModel):
    """Analysis first, then the bounded decision, then the output."""

    churn_analysis: Text = Field(description="Analyze churn_probability (high above 0.7).")
    financial_analysis: Text = Field(description="Analyze cart_value and profit_margin.")
    margin_math: Text = Field(description="Absolute profit: 'Cart $200 * 0.20 Margin = $40'.")
    max_discount_percent: Annotated[float, Field(ge=0, le=50)] = Field(
        description="The largest discount in percent; never above the margin."
    )
    offer_code: Annotated[str, Field(pattern="^[A-Z]{4,8}[0-9]{1,2}$")]
    customer_message: Text


USERS = [
    ("user_101", 0.15, 80.0, 0.35, 300.0),
    ("user_102", 0.82, 200.0, 0.20, 1500.0),
    ("user_103", 0.55, 45.0, 0.10, 90.0),
]
T = TypeVar("T", bound=BaseModel)


def open_store(path: str) -> sqlite3.Connection:
    """The feature store and audit table (created and filled when new)."""
    store = sqlite3.connect(path)
    store.execute(
        "CREATE TABLE IF NOT EXISTS features (user_id TEXT PRIMARY KEY, churn_probability REAL,"
        " current_cart_value REAL, cart_profit_margin REAL, user_ltv REAL)"
    )
    store.execute(
        "CREATE TABLE IF NOT EXISTS audit (at REAL, phase TEXT, schema TEXT, raw TEXT,"
        " seconds REAL, completion_tokens INTEGER, note TEXT)"
    )
    store.executemany("INSERT OR IGNORE INTO features VALUES (?, ?, ?, ?, ?)", USERS)
    store.commit()
    return store


def user_features(store: sqlite3.Connection, user_id: str) -> dict[str, Any] | None:
    """One user's features, or ``None`` when unknown."""
    row = store.execute("SELECT * FROM features WHERE user_id = ?", (user_id,)).fetchone()
    names = ("user_id", "churn_probability", "current_cart_value", "cart_profit_margin")
    return dict(zip((*names, "user_ltv"), row, strict=True)) if row else None


class Agent:
    """The three-phase flow over one OpenAI-compatible server, with its audit log."""

    def __init__(self, base_url: str, store: sqlite3.Connection, max_tokens: int = 400):
        self.client = OpenAI(base_url=base_url, api_key="EMPTY")
        self.model = self.client.models.list().data[0].id
        self.store = store
        self.max_tokens = max_tokens

    def run_sgr(self, phase: str, messages: list[dict[str, str]], schema: type[T]) -> T:
        """One constrained completion, exactly as seed 001 sends it to vLLM."""
        started = time.perf_counter()
        completion = self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            temperature=0.1,
            max_tokens=self.max_tokens,
            extra_body={
                "guided_json": schema.model_json_schema(),
                "guided_decoding_backend": "xgrammar",
            },
        )
        raw = completion.choices[0].message.content or ""
        tokens = completion.usage.completion_tokens if completion.usage else 0
        self.audit(phase, schema.__name__, raw, time.perf_counter() - started, tokens)
        return schema.model_validate_json(raw)

    def audit(self, phase: str, schema: str, raw: str, seconds: float, tokens: int) -> None:
        print(f"   [audit] {phase} ({schema}, {seconds:.1f} s, {tokens} tokens): {raw}")
        self.store.execute(
            "INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?)",
            (time.time(), phase, schema, raw, seconds, tokens, ""),
        )
        self.store.commit()

    def note(self, phase: str, note: str) -> None:
        print(f"   [audit] {phase}: {note}")
        self.store.execute(
            "INSERT INTO audit VALUES (?, ?, '', '', 0, 0, ?)", (time.time(), phase, note)
        )
        self.store.commit()

    def handle(self, query: str, user_id: str) -> str:
        """Route, fetch, assess and decide; returns the reply to the customer."""
        history = [
            {"role": "system", "content": routing_prompt(user_id)},
            {"role": "user", "content": query},
        ]
        print(f"processing {query!r} for {user_id}")
        decision = self.run_sgr("route", history, RouterSchema)
        print(f"routing decision: {decision.action.tool_name}")
        if isinstance(decision.action, GeneralResponse):
            return decision.action.content
        features = user_features(self.store, user_id)  # the session's user, not the model's
        if features is None:
            return "Error: user profile not found."
        history.append({"role": "assistant", "content": "Fetched the user's features."})
        history.append({"role": "user", "content": context_prompt(features)})
        risk = self.run_sgr("assess", history, RiskAssessment)
        risks = "; ".join(f"{f.severity}: {f.explanation}" for f in risk.factors)
        history.append({"role": "user", "content": f"Risks: {risks}\nNow decide the offer."})
        offer = self.run_sgr("decide", history, PricingLogic)
        margin = 100 * features["cart_profit_margin"]
        verdict = "within" if offer.max_discount_percent <= margin else "ABOVE"
        self.note("check", f"discount {offer.max_discount_percent}% is {verdict} margin {margin}%")
        return offer.customer_message


def routing_prompt(user_id: str) -> str:
    return (
        f"You are a pricing assistant for user {user_id}. If the user asks about prices, "
        "discounts or leaving, fetch their features (tool fetch_user_features with their "
        "user_id). Otherwise respond directly."
    )


def context_prompt(features: dict[str, Any]) -> str:
    return (
        f"User features: churn_probability {features['churn_probability']}, cart value "
        f"${features['current_cart_value']}, profit margin {features['cart_profit_margin']}, "
        f"lifetime value ${features['user_ltv']}. List the risks of offering a discount."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("query", nargs="?", default="I want a discount or I'm leaving!")
    parser.add_argument("--user", default="user_102")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--store", default=":memory:", help="the SQLite file")
    arguments = parser.parse_args()
    agent = Agent(arguments.base_url, open_store(arguments.store))
    print(f"\nfinal reply: {agent.handle(arguments.query, arguments.user)}")


if __name__ == "__main__":
    main()
