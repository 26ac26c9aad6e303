"""The words the rehearsal analysis reads a conversation by, in English and French.

Kept apart from the rules (providers/rehearsal_analysis.py) so that a language is added by
its grammar's closed classes, not by touching a rule: the auxiliaries that open an English
yes/no question, the interrogatives that make a French question open, the words a yes/no
answer starts with, the acknowledgements, thanks, laughter and leave-takings a topic winds
down with, the phrasings that hold the floor without answering, and the function words no
two messages share by meaning.
"""

from __future__ import annotations


def words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# An English question opening with one of these is a yes/no question ("Did you ...?").
EN_ASKS_YES_NO = words(
    "did do does are is was were will would can could have has had should shall may want wanna"
)
# One opening with these ("Anything else?") takes a yes or a no, or the thing itself.
EN_ASKS_EITHER = words("anything any anyone anybody something someone")
# French asks yes/no by intonation ("Tu viens ?"), by "est-ce que" or by inversion
# ("Viens-tu ?"), so a French question is read as yes/no unless an interrogative makes it
# open. These are interrogative wherever they stand in a question ("Tu pars combien de
# jours ?")...
FR_OPEN_ANYWHERE = words(
    "quoi quel quelle quels quelles lequel laquelle lesquels lesquelles comment pourquoi "
    "combien qu'est-ce"
)
# ... these first or last in a clause only ("C'est qui, ton collègue ?"): inside one, they
# are relatives or conjunctions ("C'est toi qui as les clés ?", "Tu veux que je le note ?").
FR_OPEN_AT_EDGES = words("qui que")  # and any elided "qu'"
# These anywhere, but for a clause they open, its subject next ("Tu pars quand en vacances ?"
# asks; "Tu m'appelles quand tu arrives ?" does not; an elided subject, "quand j'arrive", too).
FR_OPEN_BUT_CLAUSE = words("où quand")
FR_SUBJECTS = words("je tu il elle on nous vous ils elles ça")
# Words that may stand before the interrogative without making the question another kind:
# "Et toi, tu ...", "À quelle heure ...", "Avec qui ...".
FR_LEADERS = words("et mais alors donc à de avec pour chez par dans sur depuis jusqu'à")
# An alternative question offers its answers ("Le train de 8 h ou celui de 10 h ?"), unless
# the alternative is the question's own denial ("Tu viens ou pas ?").
FR_OR = "ou"
FR_OR_DENIAL = words("pas non")

# A say opening with one of these answers the way a yes/no question is answered.
YES_NO = words(
    "yes yeah yep yup no nope nah sure definitely absolutely "
    "oui ouais ouaip ouep si non nan carrément absolument évidemment exactement "
    "effectivement certainement sûrement volontiers jamais presque peut-être probablement "
    "grave done vas-y allez-y"
)
YES_NO_PHRASES = (
    ("bien", "sûr"),
    ("bien", "entendu"),
    ("tout", "à", "fait"),
    ("pas", "du", "tout"),
    ("pas", "encore"),
    ("pas", "vraiment"),
    ("pas", "trop"),
    ("pas", "sûr"),
    ("pas", "sûre"),
    ("pas", "forcément"),
    ("pas", "toujours"),
    ("pas", "question"),
    ("not", "yet"),
    ("not", "really"),
    ("not", "at", "all"),
    ("not", "sure"),
    ("of", "course"),
    ("go", "ahead"),
    ("kind", "of"),
    ("sort", "of"),
    ("i", "did"),
    ("i", "have"),
    ("just", "did"),
    ("already", "did"),
    ("c'est", "fait"),
    ("déjà", "fait"),
)
# A say opening with these answers any question, by not knowing the answer.
DONT_KNOW = (
    ("no", "idea"),
    ("dunno",),
    ("i", "don't", "know"),
    ("i", "dont", "know"),
    ("aucune", "idée"),
    ("je", "sais", "pas"),
    ("je", "ne", "sais", "pas"),
    ("sais", "pas"),
    ("chais", "pas"),
)
# A part of a say opening with one of these verbs (past LEADING words) asks the assistant
# to do something, as a question does ("remind me to...", "and text Leo...",
# "rappelle-moi...", "envoie un message à Léo"): the reply is to deal with it.
REQUESTS = words(
    "remind add set call text send tell find book play show put write note check look get "
    "make order cancel wake turn message email schedule save give read "
    "rappelle ajoute mets appelle envoie dis trouve réserve regarde cherche fais écris "
    "joue programme commande annule réveille préviens raconte donne montre enregistre garde "
    "vérifie lis"
)
# A part of a say opening with these adds a point of its own ("oh and my car broke down",
# "au fait, ma sœur a accouché"): one the reply may skip while it answers the rest.
ADDING = (
    ("also",),
    ("oh", "and"),
    ("oh", "also"),
    ("and", "also"),
    ("by", "the", "way"),
    ("btw",),
    ("plus",),
    ("au", "fait"),
    ("ah", "et"),
    ("oh", "et"),
    ("et", "aussi"),
    ("aussi",),
    ("sinon",),
)
# Words that may open a part of a say before what it does: "and can you...", "et envoie...".
LEADING = words("and oh so please also et ah puis alors stp aussi")
# What an answer to "how was ...?" / "comment ...?" says.
EVALUATIVE = words(
    "great good fine nice lovely amazing awesome wonderful fun bad awful terrible rough "
    "okay ok meh boring brilliant fantastic superb delicious beautiful disappointing "
    "super bien mieux mal génial genial géniaux géniale top nul nulle sympa cool excellent parfait "
    "incroyable horrible affreux moyen bof chouette formidable magnifique merveilleux "
    "agréable tranquille calme reposant fatigant épuisant dur difficile compliqué"
)
# A question with one of these asks for a number, a time or a date ("how old", "quelle
# heure", "combien")...
ASKS_AMOUNT = (
    ("how", "old"),
    ("how", "many"),
    ("how", "much"),
    ("how", "long"),
    ("how", "far"),
    ("what", "time"),
    ("when",),
    ("combien",),
    ("quel", "âge"),
    ("quelle", "heure"),
    ("quand",),
)
# ... and a say with a digit or one of these gives one ("eight next month", "huit ans").
NUMBERS = words(
    "two three four five six seven eight nine ten eleven twelve fifteen twenty thirty forty "
    "fifty hundred half dozen noon midnight tomorrow tonight "
    "deux trois quatre cinq six sept huit neuf dix onze douze quinze vingt trente quarante "
    "cinquante cent demi demie douzaine midi minuit demain"
)
# A say opening with these describes what a "how was ...?" asked about ("c'était délicieux").
DESCRIBING = (("it", "was"), ("it's",), ("it", "is"), ("c'était",), ("c'est",), ("ça", "a", "été"))
# A say made only of these winds the topic down: acknowledgements, thanks, laughter,
# agreement without content, and leave-takings ("ok merci", "d'accord, bonne soirée").
LULLS = frozenset(
    tuple(phrase.split())
    for phrase in (
        "you're welcome",
        "your welcome",
        "no problem",
        "no worries",
        "haha",
        "lol",
        "true",
        "thanks",
        "thank you",
        "cool",
        "ok",
        "okay",
        "fair enough",
        "right",
        "alright",
        "all right",
        "i see",
        "got it",
        "je vois",
        "ah bon",
        "merci",
        "merci beaucoup",
        "merci bien",
        "mille mercis",
        "de rien",
        "avec plaisir",
        "je t'en prie",
        "je vous en prie",
        "pas de souci",
        "pas de soucis",
        "pas de problème",
        "t'inquiète",
        "d'accord",
        "dac",
        "ça marche",
        "entendu",
        "c'est noté",
        "ça roule",
        "mdr",
        "ptdr",
        "c'est vrai",
        "trop vrai",
        "pas faux",
        "bonne soirée",
        "bonne nuit",
        "bonne journée",
        "à demain",
        "à plus",
        "salut",
        "bisous",
    )
)
LAUGHTER = "haha"

# Says made only of these answer nothing: the person holds the floor, laughs or steps away,
# and any question waiting stays waiting ("hold on, thinking", "ok, back in a sec", "lol").
# At least one must be a HOLDING phrase; FILLERS alone ("ok", "oui") may well be answers.
HOLDING = frozenset(
    tuple(phrase.split())
    for phrase in (
        "hold on",
        "hang on",
        "wait",
        "one sec",
        "one second",
        "one moment",
        "just a sec",
        "just a second",
        "just a minute",
        "give me a sec",
        "give me a minute",
        "a sec",
        "sec",
        "back in a sec",
        "back in a minute",
        "be right back",
        "brb",
        "thinking",
        "let me think",
        "i'm thinking",
        "still thinking",
        "haha",
        "lol",
        "lmao",
        "hmm",
        "attends",
        "attendez",
        "une seconde",
        "une minute",
        "deux secondes",
        "deux minutes",
        "deux sec",
        "je réfléchis",
        "laisse-moi réfléchir",
        "je reviens",
        "je reviens vite",
        "je reviens tout de suite",
        "bouge pas",
        "mdr",
        "ptdr",
        "hum",
    )
)
FILLERS = frozenset(
    tuple(phrase.split())
    for phrase in ("ok", "okay", "oh", "ah", "um", "uh", "so", "euh", "bon", "ben", "alors")
)

EN_STOP = words(
    "a an the and or but i you he she it we they me my your our their this that these those "
    "to of in on at for with about from by as is am are was were be been do did does have has "
    "had so just really very too how what when where why who which there here not no yes it's "
    "i'm im you're ok okay oh well some any all can could would will went go get got "
    "make makes making made"
)
# French function words: articles, pronouns, determiners, prepositions, conjunctions, the
# auxiliaries, "aller" and "faire", negation and the commonest adverbs. Elided forms ("l'", "qu'")
# are cut from the word before it is looked up.
FR_STOP = words(
    "le la les un une des du de au aux à et ou mais donc car ni que qui quoi quel quelle "
    "quels quelles comment où quand pourquoi combien si comme "
    "je tu il elle on nous vous ils elles me te se moi toi lui leur leurs eux y en "
    "mon ton son ma ta sa mes tes ses notre votre nos vos ce cet cette ces ça cela ceci "
    "dans sur sous par pour avec sans chez entre vers depuis "
    "suis es est sommes êtes sont était étais étaient été être "
    "ai as a avons avez ont avait avais avaient eu avoir "
    "vais vas va allons allez vont fais fait faire font "
    "ne pas plus très trop aussi encore déjà toujours bien oui non ok est-ce qu'est-ce "
    "voilà tout tous toute toutes"
)
# Words only French uses, to tell a French message from an English one.
FR_ONLY = FR_STOP - EN_STOP - words("on son ton me as plus car")
EN_ONLY = EN_STOP - FR_STOP
