from tuiapp.core.config.recipe import packing_enabled, parse_recipe
from tuiapp.core.prelaunch.recipe_rules import recipe_rules


def test_auto_packing_follows_the_method():
    assert packing_enabled(parse_recipe('[method]\nkind = "lora"\n'))
    assert not packing_enabled(parse_recipe('[method]\nkind = "prefix"\n'))
    assert not packing_enabled(parse_recipe('[method]\nkind = "lora"\n[train]\npacking = false\n'))


def test_explicit_packing_with_virtual_tokens_is_an_error():
    findings = recipe_rules(parse_recipe('[method]\nkind = "prompt"\n[train]\npacking = true\n'))
    assert [(f.level, f.key) for f in findings] == [("error", "train.packing")]
    assert "packing = false" in findings[0].fix
