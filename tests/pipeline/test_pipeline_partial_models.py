"""The partial twin of Pydantic models that name their fields or nest in unusual ways:
recursive models, aliases, fixed tuples."""

from __future__ import annotations

import pytest
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from formline.pipeline.partial import partial_model


class Node(BaseModel):
    name: str
    children: list[Node] = []


class Team(BaseModel):
    title: str
    lead: Member | None = None


class Member(BaseModel):
    name: str
    team: Team | None = None


Team.model_rebuild()


def test_a_recursive_model_has_a_partial_twin() -> None:
    # Building the twin of children: list["Node"] built the twin of Node again, forever
    # (RecursionError).
    twin = partial_model(Node)
    assert twin is partial_model(Node)
    tree = twin.model_validate({"name": "root", "children": [{"children": [{"name": "le"}]}]})
    assert tree.name == "root" and tree.children[0].name is None
    assert tree.children[0].children[0].name == "le"
    assert isinstance(tree.children[0], twin)


def test_mutually_recursive_models_share_their_twins() -> None:
    team = partial_model(Team)
    member = partial_model(Member)
    value = team.model_validate({"lead": {"name": "Ada", "team": {"title": "Eng"}}})
    assert value.title is None and isinstance(value.lead, member)
    assert isinstance(value.lead.team, team) and value.lead.team.title == "Eng"


class Aliased(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    full_name: str
    age: int = Field(validation_alias=AliasChoices("years", "age"))
    home_city: str = Field(alias="city")


def test_the_twin_reads_the_schemas_names() -> None:
    # The partial JSON is written with the schema's names (the aliases): the twin, built
    # from the annotations only, read none of them and every field stayed None.
    assert list(Aliased.model_json_schema()["properties"]) == ["fullName", "years", "city"]
    twin = partial_model(Aliased)
    value = twin.model_validate({"fullName": "Ada Lo", "years": 36, "city": "Lon"})
    assert (value.full_name, value.age, value.home_city) == ("Ada Lo", 36, "Lon")
    by_name = twin.model_validate({"full_name": "Ada"})  # populate_by_name is kept
    assert by_name.full_name == "Ada"


class Pairs(BaseModel):
    pair: tuple[int, str]
    many: tuple[int, ...] = ()


def test_a_fixed_tuple_takes_each_prefix_position_by_position() -> None:
    # As list[int] (the first type), a whole pair [1, "a"] failed, and so did the object.
    twin = partial_model(Pairs)
    assert twin.model_validate({"pair": []}).pair == ()
    assert twin.model_validate({"pair": [1]}).pair == (1,)
    assert twin.model_validate({"pair": [1, "a"]}).pair == (1, "a")
    assert twin.model_validate({"pair": [1, "a"], "many": [1, 2, 3]}).many == [1, 2, 3]
    with pytest.raises(ValidationError):
        twin.model_validate({"pair": ["one"]})  # each position keeps its type
