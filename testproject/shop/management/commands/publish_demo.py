"""Publish demo orders: ``manage.py publish_demo --count 20``."""

from django.core.management.base import BaseCommand
from django.db import transaction

from testproject.shop.events import order_paid


class Command(BaseCommand):
    help = "Publish demo 'order paid' messages (every order id ending in 7 will end up parked)."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=20)
        parser.add_argument("--start", type=int, default=1)

    def handle(self, *args, count, start, **options):
        for order_id in range(start, start + count):
            with transaction.atomic():  # as a checkout view would: the event commits with it
                order_paid.send({"order_id": order_id})
        self.stdout.write(self.style.SUCCESS(f"Published {count} order_paid message(s)."))
