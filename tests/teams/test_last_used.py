from asgiref.sync import sync_to_async

from orsplatform.teams.models import ApiKey


async def last_used(person):
    return await sync_to_async(lambda: ApiKey.objects.get(prefix=person.token.split("_")[1]).last_used_at)()


async def test_key_use_is_recorded_in_bulk_not_by_each_request(client, ors_app, owner):
    for _ in range(5):
        assert (await client.get("/math/tools", headers=owner.headers)).status_code == 200
    assert await last_used(owner) is None  # no write per request
    await ors_app.gateway.flush_activity()  # what the gateway's background pass does every flush interval
    assert await last_used(owner) is not None
