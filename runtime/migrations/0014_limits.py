from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0013_pause'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='wait_until',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='waiting',
            field=models.CharField(blank=True, default='', max_length=300),
        ),
        migrations.CreateModel(
            name='Limit',
            fields=[
                ('key', models.CharField(max_length=300, primary_key=True, serialize=False)),
                ('tokens', models.FloatField(default=0)),
                ('refilled_at', models.DateTimeField(blank=True, null=True)),
                ('not_before', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='ModelSlot',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('model', models.CharField(max_length=300)),
                ('run_id', models.CharField(max_length=32)),
                ('epoch', models.PositiveIntegerField()),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'indexes': [models.Index(fields=['model'], name='model_slot_model')],
            },
        ),
    ]
