"""Async views that call the async API, as a project's ASGI views would."""

import json

from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

import django_durable as durable
from django_durable.models import Run


@csrf_exempt
async def start(request):
    body = json.loads(request.body)
    try:
        result = await durable.astart_detailed(
            body["workflow"],
            body.get("input"),
            key=body.get("key"),
            on_duplicate=body.get("on_duplicate"),
        )
    except durable.KeyTaken as exc:
        return JsonResponse({"holder_id": str(exc.holder_id)}, status=409)
    return JsonResponse({"run_id": str(result.run_id), "outcome": result.outcome}, status=201)


async def run(request, run_id):
    try:
        found = await durable.aget_run(run_id)
    except Run.DoesNotExist:
        return HttpResponse(status=404)
    return JsonResponse({"status": found.status, "key": found.key, "result": found.result})


@csrf_exempt
async def act(request, run_id, action):
    body = json.loads(request.body or b"{}")
    try:
        if action == "cancel":
            await durable.acancel(run_id, reason=body.get("reason"))
        elif action == "retry":
            return JsonResponse({"run_id": str(await durable.aretry(run_id))})
        elif action == "rerun":
            return JsonResponse({"run_id": str(await durable.arerun(run_id))})
        elif action == "release":
            await durable.arelease_key(run_id, by=body.get("by"))
        elif action == "event":
            await durable.asend_event(
                run_id, body["name"], body.get("payload"), buffer=body.get("buffer", False)
            )
        elif action == "input":
            await durable.aprovide_input(run_id, body["name"], body.get("value"))
        else:
            return HttpResponse(status=404)
    except durable.KeyTaken as exc:
        return JsonResponse({"holder_id": str(exc.holder_id)}, status=409)
    except durable.DurableError as exc:
        return JsonResponse({"refused": type(exc).__name__, "reason": str(exc)}, status=409)
    return HttpResponse(status=204)
