"""The training recipes' schemas: one pydantic dataclass per ``ssr-lab train`` command.

Each is the single list of its command's fields (type, default, bounds, help text) and of the checks that
tie fields together; ``recipe.py`` reads YAML recipes into them. They stay dataclasses, so the trainers
read plain attributes and a config built in code is validated exactly as a recipe is.
"""
