class ChoiceRegistry:
    _choices: dict = {}

    @classmethod
    def register_subclass(cls, name):
        def deco(sub):
            ChoiceRegistry._choices.setdefault(cls, {})[name] = sub
            sub._draccus_choice_name = name
            return sub
        return deco

    @classmethod
    def get_choice_name(cls, sub):
        return sub._draccus_choice_name

    @classmethod
    def get_choice_class(cls, name):
        return ChoiceRegistry._choices[cls][name]
