"""Pure helpers every layer uses: the errors users can cause (:mod:`.errors`), parsing of specs and flags
(:mod:`.parsing`), range checks (:mod:`.checks`), atomic files (:mod:`.files`), hub errors (:mod:`.hub`) and the
augmentation levels (:mod:`.augmentation`, pure data: the data layer and the config both read it). No torch.
"""
