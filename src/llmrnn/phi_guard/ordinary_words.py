"""Surnames that are also ordinary English words (colours, trades, places, nature, adjectives, months, and the
words of clinical text): the PHI guard flags one of them only after a title or before an initial (`Mr. White`,
`WHITE, P.`), never bare, listed or possessive (`white cells`, `White's law`). A surname not listed here is
treated as rare; a surname of one or two letters (Li, Ng, Wu) reads like an abbreviation (PO, IV, OR) and is
treated as ordinary too (see identifiers.find_surnames)."""

from __future__ import annotations

_WORDS = """
abbott able acre acres alley amber angel angle archer arm armstrong arrow ash ashe ashes back bacon badger
baker ball band bank banks barber bard bare barge bark barker barley barn barns baron barrow bass batch bath
baxter bay beach beacon beam bean bear beard beck bed bee bell belt bench bend bent berry best bill birch bird
bishop black blade blake blank bliss block blood bloom blue boast boat body bold bolt bond bone booth boss
bough bow bowl bowman box boy branch brand brass brave bray bread breed brewer brick bridge bridges bright
brink broad brook brooks broom brown buck bull bunch bunker burn burns bush butcher butler butt butts cage
cain call camp candle cane cannon cant cape card carder carpenter carrier carver case cash castle chain chalk
chamber chambers champion chance chandler chapel chapman chase cheek cherry chest child chill chin christian
church clay clear cliff climb coal coat cock cole collar colt comb common cook cool cooper coral corn cotton
couch court cove cox crab crane crisp crook cross crow crown cruise dale dance dart dash dawn day dean dear
deer dell diamond dodge doe doll dolly dove down drake draper drew drum duck duke dyer eagle earl early east
edge eve fair faith falcon fall fancy farmer fawn feather fell fellow ferry field fields finch fish fisher
flag flame flash fleet fletcher flint flood flower flowers flute fog foot ford forest forge fort foster
fountain fowler fox frank free freeman friend frost fry fuller gable gale gallant game gardener garland garner
gate gates gay gem gentle gift gill glass glen glover gold golden good goodman goose grace grain grant grass
graves gray green grey grove guard guest guy hale hall ham hammer hand hands hardy hare harp harper hart hatch
hawk hay head heart heath hedge hedges hill hills holder hole holly home honey hood hook hope horn horse house
hunt hunter ivy jack jay jewel joy judge jury keen keeper key keys kind king kings knight lace lake lamb lance
land lane lark law lawless lawn leach leaf lee light lime link lion little lock long lord love low lynch maid
major march mark marks marsh marshal marshall mason master masters may mayor mead meadow meadows means mercer
merchant merry mill miller mills mint mole monk moon moor moss mountain mouse nail nash neat needle nest new
newman night noble north nurse oak oaks ore page pane park parker parks parrot parson partridge pate patience
payne peace peach pearl penny pepper perch pike pine plain plant plum pool pope porter post potter pound power
powers price pride prince prior proud purse quail queen quick rain ram range raven ray read reader reed rich
ridge ring rivers road robin rock rook root rose rowe royal rush rust sage sail sale salmon salt sand sands
savage sawyer scales seal sergeant shade shadow sharp shelf shell shepherd sheriff ship shoe shore short silk
silver singer skinner slate slater small smart smith snow soul south spade sparks sparrow speed spell spicer
spring springer stag star steel stem stern steward still stock stone storey storm story stout strange straw
street strong summer summers swan sweet swift tailor tanner taylor temple thorn tiller tower towers trail trim
trout true tucker turner vale vicar vine wade wait wake walker wall walls ward warden ware warner wash waters
watt way weaver webster well wells west wheat wheeler whistle white wild wilde will wills wing winter wise
wolf wood woods woodward worth wren wright yard young
"""
ORDINARY_WORD_SURNAMES = frozenset(_WORDS.split())
