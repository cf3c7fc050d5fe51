"""Pallet readings from dock cameras: a reading and its validation (`readings`), matching it to
a shipment and orders (`matching`), the documents it leaves (`documents`), storing a batch of
them (`batch`), and the GS1 labels they carry (`gs1_labels`)."""
