from tests.core.test_pallets_round_trips import *  # noqa
from tests.core.test_pallets_round_trips import counted  # noqa

async def test_print(counted, settings, services, tenant):
    storage, listener = counted
    camera = await camera_of(storage, tenant, "D1")
    for n in range(3):
        await record_pallets(storage, settings, [(camera, pallet(f"WARM-{n}"))])
    listener.counting = True
    await record_pallets(storage, settings, [(camera, pallet(f"N-{i}")) for i in range(8)])
    listener.counting = False
    for w in listener.waves:
        print("WAVE", w)
